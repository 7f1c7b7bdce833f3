"""Small end-to-end programs: ``python -m minigrad.examples.train_digits``."""
