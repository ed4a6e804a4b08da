"""Rules as data: a closed grammar over typed facts, evaluated without eval, returning a decision
with its reason trail."""
