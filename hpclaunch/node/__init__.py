"""One per node: the agent over torch's elastic agent (torch imported lazily) and the warm start."""
