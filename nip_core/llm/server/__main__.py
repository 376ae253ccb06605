"""``python -m nip_core.llm.server``: run the local OpenAI-compatible server."""

import sys

from nip_core.llm.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
