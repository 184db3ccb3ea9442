"""Float64 references and NumPy versions: what every kernel is checked against.

attention (softmax, masks, attention in NumPy and float64 torch), example_4x4 (the worked example),
online_softmax (the running (m, ℓ) state and the merge rule), tiled_numpy (FlashAttention's loop in
NumPy with a traffic counter), rope (rotary position embeddings).
"""
