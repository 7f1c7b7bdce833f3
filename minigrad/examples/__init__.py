"""Small end-to-end programs (``python -m minigrad.examples.train_digits``), and the lessons' sliders
(``controls``), which re-run a lesson's measurement for the value a reader picks."""
