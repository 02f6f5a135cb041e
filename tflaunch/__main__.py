from tflaunch.cli import main

main()
