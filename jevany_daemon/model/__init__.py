"""Everything about the weights: loading, checkpoints, the pointer head, tiny test models.

sources.py         what a model source names: a local directory, or a hub id with a revision
loading.py         loading a decision model: a JevAny checkpoint (LoRA + head.pt) or a plain causal LM
checkpoint.py      JevAny checkpoint facts: head.pt metadata, decision delimiters, verbalizer symbols
adapter.py         a checkpoint's LoRA adapter: applied, scaled, then merged or kept apart
pointer_head.py    the trained pointer head: DECIDE queries each option's close token
decision_model.py  what a loaded decision model is: a causal LM, its tokenizer, its readout
placement.py       where the weights go: one device, or several GPUs by Accelerate's device map
kernels.py         which kernels run a hybrid model's linear-attention layers
invariant.py       batch-invariant kernels: products in fixed pieces, attention in fixed key blocks
multimodal.py      media on multimodal checkpoints: the processor, and the one forward that reads it
qwen_video.py      Qwen3-VL's video preprocessing in plain torch, for hosts without torchvision
device_reports.py  what a worker says about its device(s): name, memory in use and in total
free_attention.py  attention made free, for the simulated accelerator
quiet.py           transformers' progress bars, off while a model loads or is built
tiny.py            small random models of real architectures, for tests and smoke deployments
tiny_vision.py     the tiny multimodal model's vision tower and processor
"""
