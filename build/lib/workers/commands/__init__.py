"""One module per `vessel-workers` verb: each has `add_parser(subparsers)` and `run(args)`."""
