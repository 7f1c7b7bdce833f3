# Ported to minigrad from pytorch/examples, time_sequence_prediction/generate_sine_wave.py at
# commit 2b456e809fe249f2153616578c116e4b2954ca18 (BSD-3-Clause licence, Copyright (c) 2017 PyTorch
# contributors). Only the import line is changed (the original is kept in a comment).
import numpy as np
import minigrad as torch  # import torch

np.random.seed(2)

T = 20
L = 1000
N = 100

x = np.empty((N, L), "int64")
x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
data = np.sin(x / 1.0 / T).astype("float64")
torch.save(data, open("traindata.pt", "wb"))
