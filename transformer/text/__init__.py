"""Text in: pairs of strings from files, Hugging Face datasets or Multi30k, BPE, and batches of token ids sized by
tokens."""
