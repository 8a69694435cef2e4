"""Request traces (readers and generators), prompt sets, quality tables and prompt embeddings.

Modules: ``traces.trace`` (the ``Trace`` model), ``traces.generators`` (generators, spec strings,
rate shapes), ``traces.formats`` (file formats, ``load_trace``, ``write_trace``), ``traces.prompts``
(``PromptSet``, ``load_prompts``, ``builtin_prompts``), ``traces.quality`` (``QualityTable``),
``traces.synthetic`` (SYNTHETIC quality tables calibrated to ARGUS), ``traces.diffserve``
(DiffServe's measured confidences, f(t), runtimes) and ``traces.embeddings`` (MiniLM prompt
embeddings, ``SimilarityIndex``). Importing any of them never imports torch.
"""
