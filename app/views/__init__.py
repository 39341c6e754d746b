"""What the dashboard's templates are fed: the form engine, the run view folded from events, and what each
page computes for its template. Pure where it can be; the readers that fold a run's events take a session."""
