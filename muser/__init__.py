"""muser: hybrid-attention inference engine."""
