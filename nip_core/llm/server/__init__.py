"""The local OpenAI-compatible server (chat completions, files, fine-tuning).

Start it with ``python -m nip_core.llm.server`` / ``nipflow api-server`` (see
:mod:`~nip_core.llm.server.cli`), or from Python with
:class:`nip_core.llm.launcher.LocalApiServer`. The model behind it is described in
:mod:`nip_core.llm.policy`.
"""
