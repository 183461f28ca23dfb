"""The operator's side: reading a catalog file and publishing what changed."""
