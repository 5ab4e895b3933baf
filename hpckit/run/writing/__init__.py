"""One checkpoint on the ranks: the values that cross between them (``plan``: announcements,
plans, what a rank persisted; a rank's part of the names several ranks hand and the list it
sent last; rank 0's plan is ``run.commit.planning``'s), what a rank hands to ``report()``
and where its files wait (``staging``; a committed checkpoint handed again is read from
links: ``writer.pinned``), the files each rank writes or hashes (``shares``), and this rank
writing its share now or in the background, with each node's resume states (``writer``; its
checkpoints still in flight: ``InFlight``, the one owner of that set and its futures).

May import: ``run.mpi``, experiment (manifest values), checkpoint, storage and the ground
layer. Never the commit protocol above it.
"""
