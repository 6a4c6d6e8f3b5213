"""Study storage -> tidy DataFrame -> statistics -> figures -> report.html / report.md / results.csv."""
