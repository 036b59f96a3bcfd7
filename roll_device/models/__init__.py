"""Models roll-device makes itself, so that no run or test downloads anything."""
