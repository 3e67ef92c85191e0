"""One module per `rebuno` subcommand."""
