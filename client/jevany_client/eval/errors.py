"""What jevany-eval refuses: one error type, printed as is by the command line."""


class EvalError(Exception):
    """A suite, results file or option that jevany-eval cannot use; the message says where and why."""
