"""Text out: greedy and beam search, the Translator (text in, text out), BLEU and chrF, export to CTranslate2."""
