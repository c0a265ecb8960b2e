"""The configs that ship with tfm, as package data: ``tfm train --config base`` finds them from any directory."""
