"""Export: a checkpoint as a CTranslate2 model or a Hugging Face MarianMTModel folder, with its model card."""
