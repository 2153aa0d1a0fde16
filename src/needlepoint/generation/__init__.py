"""One assistant turn over a model session: prompt rendering, sampling, the tool-call grammar,
output segmentation, stream events and tool retrieval."""
