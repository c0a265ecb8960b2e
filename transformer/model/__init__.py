"""The Transformer read against the paper (embeddings, positions, attention, layers), the state its decoder keeps
between steps, and the code that exists only for speed."""
