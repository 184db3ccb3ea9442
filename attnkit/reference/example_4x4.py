"""The 4×4 worked example that lessons 1 and 3 compute by hand: N = d = 4, d_v = 2, scale 1/√4 = 1/2."""
from __future__ import annotations

import numpy as np

Q = np.array([[1, 0, 2, 0],
              [0, 1, 1, 0],
              [1, 1, 0, 1],
              [0, 2, 1, 1]], dtype=np.float64)        # [N, d]
K = np.array([[2, 1, 0, 0],
              [0, 1, 1, 0],
              [1, 0, 1, 1],
              [0, 0, 2, 1]], dtype=np.float64)        # [N, d]
V = np.array([[1, 0],
              [0, 1],
              [1, 1],
              [2, 1]], dtype=np.float64)              # [N, d_v]
SCALE = 0.5

# The figures as the source material prints them (rounded to 4 decimals there).
SOURCE_P = np.array([[0.1570, 0.1570, 0.2588, 0.4269],
                     [0.1887, 0.3113, 0.1887, 0.3113],
                     [0.4271, 0.1571, 0.2589, 0.1571],
                     [0.1888, 0.3112, 0.1888, 0.3112]])
SOURCE_O = np.array([[1.2696, 0.8427],
                     [1.0000, 0.8113],
                     [1.0000, 0.5731],
                     [1.0000, 0.8112]])
