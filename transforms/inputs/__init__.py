"""Finding the inputs and reading them once: folders, manifests, COCO and VOC annotations, the first pass."""
