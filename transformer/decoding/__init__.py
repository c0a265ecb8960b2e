"""Text out: greedy and beam search, and the Translator (text in, text out)."""
