"""The app's CSS. Kept as a string rather than a .tcss file so a wheel install needs no package-data entry."""

CSS = """
#status-line {
    height: 1;
    padding: 0 1;
    background: $panel;
    color: $text-muted;
    width: 1fr;
}

DataTable {
    height: 1fr;
}

DataTable, #review-card, #capacity-notes {
    border: round $primary 50%;
    border-title-color: $accent;
    border-title-style: bold;
}

#overview-grid {
    grid-size: 2 3;
    grid-columns: 1fr 1fr;
    grid-rows: 9 1fr 1fr;
}

#overview-grid > #roles {
    column-span: 2;
}

#review-body > #review {
    height: 2fr;
}

#review-card {
    height: auto;
    min-height: 5;
    padding: 0 1;
}

#review-thumb {
    height: auto;
    padding: 0 1;
    display: none;
}

#ledger-body > DataTable {
    height: 1fr;
}

#audit-body > #checks {
    height: 3fr;
}

#audit-body > #offending {
    height: 2fr;
}

#adjust-box > .modal-hint {
    margin-top: 0;
}

#capacity-body > DataTable {
    height: auto;
    max-height: 14;
}

#capacity-notes {
    height: auto;
    padding: 0 1;
}

#task-header {
    height: auto;
    padding: 0 1;
    border: round $accent 40%;
}

ConfirmModal, HelpScreen, AdjustForm, EmptyDatabaseScreen {
    align: center middle;
}

.modal-box {
    width: 90;
    max-width: 95%;
    height: auto;
    max-height: 90%;
    padding: 1 2;
    border: thick $error 60%;
    background: $surface;
}

#help-columns {
    height: auto;
}

#help-columns > Static {
    width: 1fr;
}

HelpScreen .modal-box {
    border: thick $primary 60%;
}

.modal-title {
    text-style: bold;
    margin-bottom: 1;
}

.modal-hint {
    color: $text-muted;
    margin-top: 1;
}

.modal-error {
    color: $error;
    height: auto;
}

.modal-buttons {
    height: auto;
    align-horizontal: right;
    margin-top: 1;
}

.modal-buttons Button {
    margin-left: 2;
}

FilterPrompt {
    align: center bottom;
}

#filter-box {
    width: 100%;
    height: auto;
    padding: 0 1;
    background: $surface;
    border-top: solid $primary;
}
"""
