"""Training strategies; importing this package registers them."""
