"""The wire: message kinds and the header codec (:mod:`.messages`), and a typed header
with its builder and reader per message (:mod:`.headers`, defined by plane in
:mod:`.control`, :mod:`.placement` and :mod:`.data`). Imports nothing above
:mod:`trimtab.errors`; no torch."""
