-- What an agent publishes about itself (docs/protocol.md §36): a description and the JSON
-- Schemas of its input and output, kept as the canonical JSON text received, and when it last
-- published. A re-registration keeps them; deleting the agent removes them with its row.
ALTER TABLE agents
    ADD COLUMN description text,
    ADD COLUMN input_schema text,
    ADD COLUMN output_schema text,
    ADD COLUMN metadata_updated_at timestamptz;
