"""The `module` model kind: any nn.Module with fixed-shape tensor inputs.

kind.py (ModuleKind: parity output by output, localization, float16 sensitivity,
accuracy-aware refinement), loaders.py (MODEL argument -> nn.Module + sample inputs),
embedding_rows.py (how far random token ids may go), export.py (the one float32 export),
global_pool.py (whole-map pools as means). Uses the shared pipeline modules of
tpu_pipeline.convert; never imports convert.lm or convert.iot (pyproject's independence
contract).
"""
