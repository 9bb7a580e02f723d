"""Model families on one small contract (see ``protocol.py``) and the lazy family registry."""
