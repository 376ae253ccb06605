"""``python -m nipflow_llm_server.server``: run the local OpenAI-compatible server."""

import sys

from nipflow_llm_server.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
