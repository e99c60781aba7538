"""One image's pixels: bounded decoding, resizing, normalizing, and the boxes and masks that move with them."""
