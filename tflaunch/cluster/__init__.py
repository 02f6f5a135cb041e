"""The cluster file and its plan: read and check the YAML (yamlfile, schema, config), expand host
lists, and place every task (plan). Pure: nothing here starts a process or opens a socket."""
