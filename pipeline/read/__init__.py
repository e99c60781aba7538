"""Reading a published dataset back: tf.data, verify, contact sheets, TFDS export."""
