"""Nexmark on streamsnap: the online-auction benchmark's queries (see `reference` for what each
computes), over the generator in `streamsnap.connectors.nexmark`."""
