"""Request traces (readers and generators) and prompt sets."""
