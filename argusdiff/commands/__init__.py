"""One module per CLI subcommand; each imports its heavy dependencies inside ``run``."""
