"""An ingestion worker modelled on a production one: contracts, services, processors, a
producer and a one-command demo (``./scripts/demo``). See README.md."""
