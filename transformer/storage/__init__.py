"""Files on disk: atomic writes and replacements, and the record of what tfm wrote (so that only that is ever
deleted or replaced)."""
