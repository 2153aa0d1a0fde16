"""Model families (`needle3/`, `needle2/`), the shared pieces they use (ops, ladder), the
prepared-weight cache and model lookup (`hub`)."""
