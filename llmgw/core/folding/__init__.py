"""The fold: the state the log folds to, its indexes, and each event applied (decided actions
checked again as they land)."""
