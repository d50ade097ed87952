"""The drafters, one module per kind: Medusa (medusa.py, Medusa-2 in medusa2.py), EAGLE-1/2 (eagle.py), EAGLE-3
(eagle3.py), MTP (mtp.py), DFlash (dflash.py) and P-EAGLE (peagle.py), each a config dataclass and an nn.Module, built
by factory.py. What several kinds share is in parts/."""
