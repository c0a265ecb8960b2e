"""``tfm serve``: request checks, the batcher that owns the model, the HTTP app and its page (the ``serve`` extra)."""
