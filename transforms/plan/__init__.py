"""What becomes of each image before any is converted: labels, duplicates, splits, reuse, the input fingerprint."""
