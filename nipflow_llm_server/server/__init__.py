"""The local OpenAI-compatible server (chat completions, files, fine-tuning).

Start it with ``python -m nipflow_llm_server.server`` / ``nipflow api-server`` (see
:mod:`~nipflow_llm_server.server.cli`), or from Python with
:class:`nipflow_llm_server.launcher.LocalApiServer`. The model behind it is described in
:mod:`nipflow_llm_server.policy`.
"""
