"""What the Trainer example scripts share, installed with the package so they import it without path edits.

Not imported by `import panm_hf` (the memory core and the model adapters never depend on it); it needs the
`examples` extra (`pip install -e ".[examples]"`: datasets, accelerate, tokenizers, ...).

- `script_conventions`: transformers' example-script conventions (data files, --do_* steps, resuming from the
  last checkpoint, metrics, the model card, `results.json`); translation, math, bAbI, SCAN and question answering.
- `seq2seq`: the seq2seq examples' model flags, random backbones, plain or PANM models and their Trainer;
  translation, math, bAbI and SCAN.
- `scan_data`: SCAN's length cut-off protocol, word vocabulary and scoring; SCAN and the causal-LM example.
- `controls`: training-time controls (PANM with its pointer reads switched off).
"""
