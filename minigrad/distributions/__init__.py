"""``minigrad.distributions``: probability distributions with torch's API (``torch.distributions``).

``Normal``, ``Categorical`` and ``Bernoulli`` sample, score (``log_prob``) and measure
(``entropy``) with differentiable minigrad ops: a policy-gradient agent samples an action from a
``Categorical`` and backpropagates ``-log_prob * return`` into its network, and a VAE samples its
code with ``Normal.rsample``. Parameters and values are checked as torch checks them
(``constraints``). Other distributions of torch's are not written: their names raise an
AttributeError pointing at ``docs/pytorch_compat.md``.
"""

from minigrad.distributions import constraints  # noqa: F401
from minigrad.distributions.bernoulli import Bernoulli
from minigrad.distributions.categorical import Categorical
from minigrad.distributions.distribution import Distribution
from minigrad.distributions.normal import Normal
from minigrad.compat.unsupported import module_getattr as _module_getattr

__all__ = ["Bernoulli", "Categorical", "Distribution", "Normal", "constraints"]

__getattr__ = _module_getattr(__name__)
