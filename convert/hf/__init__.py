"""Hugging Face task folders (issue 39): a folder saved with `save_pretrained` beside its
processor, converted by the folder alone. config.json's `architectures` picks the task family
(families.py: one loader per family behind one registry, as Transformers maps an architecture to
its AutoModelFor... class); the folder's own processor turns raw data (raw_data.py: image folders,
CSV/JSONL text, wav folders, masks, boxes) into the model's inputs; id2label names the classes. The `hf-task`
model kind (kind.py) hands the loaded model to the module pipeline."""
