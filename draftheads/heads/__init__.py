"""The draft modules: Medusa (medusa.py, Medusa-2 in medusa2.py), EAGLE-1/2 (eagle.py), EAGLE-3
(eagle3.py) and MTP (mtp.py), each a config dataclass and an nn.Module, built by factory.py."""
