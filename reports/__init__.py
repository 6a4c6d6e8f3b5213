"""A study's report: its storage and trial files read into tidy tables (collect), judged with analysis/,
drawn (plots) and written whole as report.html, report.md and results.csv (render); and `ablate compare`'s
two runs side by side."""
