"""Prefect flows: one module per pipeline stage, plus the command line that runs them in-process."""

import os

# Without a server, Prefect starts an embedded one and gives up after 20 s. On a 2-core machine with
# other jobs running that start takes 16-25 s (a fresh PREFECT_HOME, two to four CPU hogs), so a
# busy machine would fail the first command. Set before Prefect reads its settings; a user's own
# value wins.
EPHEMERAL_STARTUP_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
os.environ.setdefault(EPHEMERAL_STARTUP_TIMEOUT, "180")
