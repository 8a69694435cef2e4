"""Prompt → level classifier (BERT), image discriminator (EfficientNet-V2), quality scorers
(PickScore-style and CLIPScore via open_clip) and their offline training. Heavy imports are lazy."""
