from tracer.data.corpora import main

main()
