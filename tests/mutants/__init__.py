"""Catalogues of plausible wrong answers and of correct variants, one module per lab (see tests/mutation.py)."""
