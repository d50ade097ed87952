"""The parts the kinds in heads/ share; no part imports a kind.

    draft_layer       one decoder layer run on its own outputs (EAGLE-1/2, EAGLE-3, P-EAGLE): the training-time
                      test and tree drafting
    block_layer       the block-parallel layer (DFlash); block_training: its masked training; block_drafting:
                      one-forward drafting, trees grown from per-depth distributions (DFlash, P-EAGLE)
    peagle_training   P-EAGLE's one-pass training with COD subsampling
    mtp_structure     how MTP modules are laid out: ours (mtp) or a checkpoint's own (native)
    draft_tree        static and EAGLE-2 dynamic trees grown from a drafter's children logits
    draft_vocab       the draft vocabulary (drafter.vocab)
    layers            the target's own decoder layer, its KV cache, masks, and the target's frozen parts a head binds
    common            losses, metrics and small helpers every head uses
    files             what a drafter's folder holds (drafter.files)
    protocol          the drafter protocols' methods written once: from_target, param_groups, reset/observe/propose
"""
