"""The Transformer read against the paper (embeddings, positions, attention, layers) with its one incremental decoder
step, the state that step keeps, and the code that exists only for speed: modules decoding swaps into a copy of the
model (linears, cross_fold) and the rest (speed)."""
